"""The service the page and the API call: requests, sessions, models, hosting. No Gradio, no HTML."""
