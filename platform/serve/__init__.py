"""The serve layer (ServeCore): semantic calls, semantic variables and their DAG."""
