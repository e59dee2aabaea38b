package nomadclient

import (
	"errors"

	"github.com/hashicorp/nomad/api"
)

// StatusCode is the HTTP status of a Nomad API error, 0 when the request
// got no answer (a transport error, a timeout). The API client returns
// its error by value or by pointer depending on the call: both count.
func StatusCode(err error) int {
	var ue api.UnexpectedResponseError
	if errors.As(err, &ue) && ue.HasStatusCode() {
		return ue.StatusCode()
	}
	var uep *api.UnexpectedResponseError
	if errors.As(err, &uep) && uep != nil && uep.HasStatusCode() {
		return uep.StatusCode()
	}
	return 0
}
