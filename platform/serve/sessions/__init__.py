"""Sessions: made, authenticated, expired and deleted; one-shot OpenAI sessions."""
