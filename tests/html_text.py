"""What a browser would show of an HTML fragment: its text, and the tags it would build."""

from html.parser import HTMLParser


class ShownHTML(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text, self.tags = "", []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text += data


def shown(html: str) -> ShownHTML:
    p = ShownHTML()
    p.feed(html)
    return p
