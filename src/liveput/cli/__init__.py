"""The command-line interface: parses options, calls the library, renders with rich."""
