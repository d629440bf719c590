"""The exit-code contract and its exceptions, and files written whole (write-then-rename)."""
