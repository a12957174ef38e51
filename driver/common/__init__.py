"""Pure helpers every part stands on: errors, logs, wire formats, quantities, limits."""
