from django import forms

from .choices import TokenScope
from .roles import is_operator


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=60)
    scopes = forms.MultipleChoiceField(
        choices=[
            (TokenScope.READ, "read (jobs, leases, pools)"),
            (TokenScope.LOGS_READ, "logs:read (job logs)"),
            (TokenScope.OUTPUTS_READ, "outputs:read (job outputs)"),
            (TokenScope.WRITE, "write"),
        ],
        widget=forms.CheckboxSelectMultiple,
        initial=[TokenScope.READ, TokenScope.LOGS_READ, TokenScope.OUTPUTS_READ, TokenScope.WRITE],
    )
    ttl_days = forms.IntegerField(min_value=1, max_value=365, initial=90, label="Valid for (days)")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        if is_operator(user):  # only operators may hold operate (the service checks it too)
            self.fields["scopes"].choices += [
                (TokenScope.OPERATE, "operate (nodes)"),
                (TokenScope.METRICS_READ, "metrics:read (a Prometheus scrape token)"),
            ]
