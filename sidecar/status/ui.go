package status

import "embed"

// uiFiles is the status page: plain HTML, CSS and JavaScript with no
// library and nothing fetched from elsewhere (clusters often have no way
// out to the internet, and the page must work there).
//
//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS
