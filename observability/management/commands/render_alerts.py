from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from observability.alerts import render

TARGET = Path("deploy") / "prometheus" / "alerts.yml"


class Command(BaseCommand):
    help = "Write deploy/prometheus/alerts.yml from observability/alerts.py."

    def handle(self, *args, **options):
        path = settings.BASE_DIR / TARGET
        path.write_text(render())
        self.stdout.write(f"wrote {TARGET}")
