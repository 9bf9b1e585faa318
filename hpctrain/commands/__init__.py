"""One module per ``hpctrain`` subcommand: ``register(subparsers)`` adds its parser and handler."""
