from datetime import timedelta

from django import forms

DRAIN_DEADLINE_MAX_MINUTES = 30 * 24 * 60  # 30 days


class DrainForm(forms.Form):
    """The console's drain: an optional deadline, in whole minutes from now (0 or empty: none)."""

    deadline_minutes = forms.IntegerField(
        min_value=0, max_value=DRAIN_DEADLINE_MAX_MINUTES, required=False
    )

    def deadline(self, now):
        minutes = self.cleaned_data["deadline_minutes"]
        return now + timedelta(minutes=minutes) if minutes else None

    def error_text(self) -> str:
        return "; ".join(
            f"drain deadline (minutes): {message}"
            for message in self.errors.get("deadline_minutes", [])
        )
