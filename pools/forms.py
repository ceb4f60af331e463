from django import forms

from .choices import TokenScope


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=60)
    scopes = forms.MultipleChoiceField(
        choices=[(TokenScope.READ, "read"), (TokenScope.WRITE, "write")],
        widget=forms.CheckboxSelectMultiple,
        initial=[TokenScope.READ, TokenScope.WRITE],
    )
    ttl_days = forms.IntegerField(min_value=1, max_value=365, initial=90, label="Valid for (days)")
