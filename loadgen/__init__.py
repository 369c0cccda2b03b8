"""Load generators: simulated chat users driving a real engine (the dashboard's demo button)."""
