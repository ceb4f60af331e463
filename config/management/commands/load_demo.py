from django.core.management.base import BaseCommand

from config.demo import load_demo


class Command(BaseCommand):
    help = "Create the demo pool, tenants, shapes, people and nodes (idempotent)."

    def handle(self, *args, **options):
        people = load_demo()
        self.stdout.write("Demo loaded. Sign in at http://127.0.0.1:8000/ as:")
        for username, password, roles in people:
            self.stdout.write(f"  {username:<6} / {password:<16} {roles}")
