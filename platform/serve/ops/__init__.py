"""What operators see: views, metrics, load history, activity log."""
