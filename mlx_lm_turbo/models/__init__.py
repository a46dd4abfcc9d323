"""Built-in architecture adapters, one file per family, each a plugin of its own."""
