"""``python -m miles_lite.cli``: the same as ``miles-lite``."""

from miles_lite.cli import main

raise SystemExit(main())
