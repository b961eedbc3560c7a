"""Every HTML builder of the page, pure functions of plain data."""
