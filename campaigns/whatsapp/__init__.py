"""WhatsApp campaigns: the send job, who may receive a batch, the template messages, Meta's answers
into a plan and the plan written."""
