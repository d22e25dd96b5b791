"""Models of the sites app arrive with its issue; the app is wired so URLs, templates and migrations have a home."""
