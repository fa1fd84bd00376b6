"""The ERP (Linx Millennium) sales and customer syncs: their connections, state, schedules and jobs.

Only `project` may import it; it writes the platform's Store, Customer and Sale (announcing sales
through `crm.hooks`) and plugs into the platform from `apps.py:ready()`.
"""
