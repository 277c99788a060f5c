"""What a run folder says, for people: `summary` (summary.md, from a scan's typed result) and `html`
(report.html, rebuilt from the run folder's files alone through quantscan.runfolder; plots in
`plots`, stylesheet and script in `assets/`)."""
