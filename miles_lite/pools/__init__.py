"""pools."""
