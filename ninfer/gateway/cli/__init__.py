"""The `ninfer` command line: one `cmd_*` module per subcommand, registered by `main`."""
