"""The Memory tab: the KV dashboard (page), its view-model (view), HTML panels, history plots and
the KV arithmetic of the what-if tables. It reads only the engine's snapshot contract."""
