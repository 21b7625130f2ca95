"""The model: config parsing, rotary embeddings, weight loading and the LLaMA-family network."""
