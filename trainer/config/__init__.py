"""The configuration contract: every setting declared once, checked, looked up by name, as CLI flags."""
