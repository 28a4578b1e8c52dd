"""The OpenAI-compatible HTTP gateway: a client of the router, holding no routing state."""
