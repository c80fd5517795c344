"""What every part of miles_lite shares: one resource lifecycle, field checks, JSON on the
wire, serving an aiohttp app on loopback, reused workers' hand-over (:mod:`.idle`), and
:func:`run_sync`. Private: nothing here is API except what the top level re-exports."""
