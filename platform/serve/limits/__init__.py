"""What one client may ask of the ServeCore, checked before anything is created."""
