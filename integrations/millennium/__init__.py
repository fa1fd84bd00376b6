"""Linx Millennium ERP: the client (paging, dates, CPF/CNPJ, phones) and a sandbox server."""
