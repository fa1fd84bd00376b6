"""Campaign emails: the content (compiled once per process) and the send job."""
