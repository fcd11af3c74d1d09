"""A group's computation as a loop nest, and one emitter per output language."""
