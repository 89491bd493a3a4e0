"""The docs test: every code block of README.md and docs/*.md runs against a dev up cluster."""
