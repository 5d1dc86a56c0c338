"""``python -m bench.peers``: durable_agent side by side with other task systems."""
