"""Operating a live job: the job file, launch/stop/resume, the status kept in the store, the
dashboard and the metrics (``liveput launch|status|stop|resume``; see docs/operate.md)."""
