from django.apps import AppConfig


class DemoConfig(AppConfig):
    """`manage.py demo` (make run's demo data). It creates computers, jobs and tokens, so it lives above
    every app it uses (DESIGN §2), not in mado."""
    name = "demo"
