"""Weight files: fetched, verified and loaded (`hub`: releases, URLs, model cards), exported
(`export`), and export sets checked without torch (`export_set`)."""
