"""measure building blocks."""
