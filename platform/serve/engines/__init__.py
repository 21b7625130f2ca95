"""The engines the ServeCore schedules on: clients, registration, tokenizers."""
