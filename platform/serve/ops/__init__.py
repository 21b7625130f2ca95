"""What operators see: views, metrics, load history, activity log, the OpenAI front's recent requests."""
