"""What makes Keras's Python traceable by torch.compile, and its compile reusable."""
