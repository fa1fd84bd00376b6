"""How anything is sent to a customer: the layer between the platform (`crm`, the integrations
app) and the domain apps that send (campaigns, surveys, and later flows and conversations).

It owns what a provider's answer means: `messaging.decisions` turns a WhatsApp or email answer into
one decision — sent, outcome unknown (never resent), released (no attempt spent), retried, or
failed — with the side effects it calls for (pause the organization or the number, opt the
customer out, stop the campaign, suppress the address). Every sender applies that decision to its
own rows; none decides on its own.

It also owns what every sender shares on the way out: the email template language
(`email_render`), the email transport and `deliver` (`email_transport`), the rate-limit keys
(`pacing`) and the organization's email suppression list (`models.EmailSuppression`,
`suppression`).

Domain apps may import anything here; this package imports only the platform and providers.
"""
