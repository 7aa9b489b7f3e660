"""raysaga.sagas: compensation registry and executor."""
