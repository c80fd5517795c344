"""What every part of miles_lite shares: one resource lifecycle, field checks, JSON on the
wire, serving an aiohttp app on loopback, and :func:`run_sync`. Private: nothing here is
API except what the top level re-exports."""
