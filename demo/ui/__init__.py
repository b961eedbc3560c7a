"""The Gradio page, feature by feature; it imports no torch."""
