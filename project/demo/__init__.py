"""The demo organization's data: stores, customers and sales, provider settings, the ERP connection
and flows. Only the composition root's commands (`manage.py demo`, `up`) and tests use it; no production
module imports it (the `demo` import contract)."""
