package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/hashicorp/nomad/api"
)

// The event stream is read here rather than through
// api.EventStream().Stream: that decodes payloads into map[string]any and
// then through mapstructure, which (checked with the pinned api version)
// turns int64 nanosecond timestamps into float64 (off by up to 256 ns, so
// a streamed object never equals its listed self) and drops typed device
// attributes (a GPU's memory reads "<unknown>": mapstructure ignores the
// json tags of api.Attribute). Decoding the payload as JSON straight into
// the api types gives exactly what the list endpoints give.

// streamBatch is one line of /v1/event/stream: the events of one index.
type streamBatch struct {
	Index  uint64
	Events []streamEvent
	err    error // set on the last batch of a failed stream
}

type streamEvent struct {
	Topic   api.Topic
	Type    string
	Key     string
	Index   uint64
	Payload json.RawMessage
}

// eventPayload holds the payload kinds the watcher subscribes to.
type eventPayload struct {
	Node       *api.Node
	Job        *api.Job
	Deleted    bool
	Allocation *api.Allocation
	Evaluation *api.Evaluation
}

// openStream subscribes to the topics the view needs from index on and
// delivers batches until ctx ends or the stream fails; the last batch of
// a failed stream carries its error, and the channel is closed after it.
func openStream(ctx context.Context, client *api.Client, index uint64, namespace string) (<-chan streamBatch, error) {
	v := url.Values{}
	for _, t := range []api.Topic{api.TopicNode, api.TopicJob, api.TopicAllocation, api.TopicEvaluation} {
		v.Add("topic", string(t)+":*")
	}
	v.Set("index", strconv.FormatUint(index, 10))
	q := &api.QueryOptions{Namespace: namespace}
	body, err := client.Raw().Response("/v1/event/stream?"+v.Encode(), q.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	ch := make(chan streamBatch, 16)
	go func() {
		defer close(ch)
		defer body.Close()
		dec := json.NewDecoder(body)
		for {
			var b streamBatch
			if err := dec.Decode(&b); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF // the server never ends a stream on its own
				}
				b = streamBatch{err: err}
			} else if b.Index == 0 && len(b.Events) == 0 {
				continue // heartbeat
			}
			select {
			case ch <- b:
			case <-ctx.Done():
				return
			}
			if b.err != nil {
				return
			}
		}
	}()
	return ch, nil
}

func (e *streamEvent) payload() (*eventPayload, error) {
	var p eventPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return nil, fmt.Errorf("decode %s event %s at index %d: %w", e.Topic, e.Type, e.Index, err)
	}
	return &p, nil
}
