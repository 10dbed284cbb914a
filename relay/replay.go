package relay

// Replay requests: how `relay replay` asks the leader to republish
// archived events, and how their progress is read (see replayer.go for
// how the leader executes them).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/relay/relay/store"
)

// HeaderReplay marks a republished event; its value is the replay request
// id. The event keeps its original relay-event-id header.
const HeaderReplay = "relay-replay"

// Replay request statuses.
const (
	ReplayPending   = "pending"
	ReplayRunning   = "running"
	ReplayDone      = "done"
	ReplayCancelled = "cancelled"
	ReplayFailed    = "failed"
)

// ReplayFilter selects archived events to republish: those created in
// [Since, Until), or from the event FromEvent on in publication order,
// optionally of one topic and one key.
type ReplayFilter struct {
	Since     *time.Time `json:"since,omitempty"`
	Until     *time.Time `json:"until,omitempty"`
	FromEvent string     `json:"from_event,omitempty"`
	Topic     string     `json:"topic,omitempty"`
	Key       *string    `json:"key,omitempty"`
}

// Validate checks that f selects a starting point.
func (f ReplayFilter) Validate() error {
	if (f.Since == nil) == (f.FromEvent == "") {
		return errors.New("a replay needs exactly one of a start time (since) or a start event (from_event)")
	}
	if f.Since != nil && f.Until != nil && !f.Until.After(*f.Since) {
		return errors.New("the replay's until must be after its since")
	}
	return nil
}

// DB is what the replay and dead-letter functions need of a connection,
// pool or transaction: the store's executor.
type DB = store.DB

// ReplayRequest is one row of <schema>.replay_requests.
type ReplayRequest struct {
	ID         int64        `json:"id"`
	Filter     ReplayFilter `json:"filter"`
	Status     string       `json:"status"`
	Total      *int64       `json:"total"`
	Done       int64        `json:"done"`
	Error      string       `json:"error,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	StartedAt  *time.Time   `json:"started_at,omitempty"`
	UpdatedAt  time.Time    `json:"updated_at"`
	FinishedAt *time.Time   `json:"finished_at,omitempty"`
}

// Finished reports whether the request will make no more progress.
func (q ReplayRequest) Finished() bool {
	return q.Status == ReplayDone || q.Status == ReplayCancelled || q.Status == ReplayFailed
}

// replayStart returns the archive seq after which f's events begin, and
// false when f names an event the archive does not hold.
func replayStart(ctx context.Context, s storage, db DB, f ReplayFilter) (int64, bool, error) {
	var start *int64
	var err error
	if f.FromEvent != "" {
		start, err = s.ArchiveStartAtEvent(ctx, db, f.FromEvent)
	} else {
		start, err = s.ArchiveStartSince(ctx, db, *f.Since)
	}
	if err != nil {
		return 0, false, fmt.Errorf("finding the replay's first event: %w", err)
	}
	if start == nil {
		if f.FromEvent != "" {
			return 0, false, nil
		}
		// Nothing that recent yet: the range is empty.
		top, err := s.ArchiveTop(ctx, db)
		if err != nil {
			return 0, false, err
		}
		return top, true, nil
	}
	return *start, true, nil
}

// archiveFilterOf is what of f selects among archived events after the
// replay's start.
func archiveFilterOf(f ReplayFilter) store.ArchiveFilter {
	return store.ArchiveFilter{Since: f.Since, Until: f.Until, Topic: f.Topic, Key: f.Key}
}

// CountReplay counts the archived events a replay with filter f would
// republish now (the dry run).
func CountReplay(ctx context.Context, db DB, schema string, f ReplayFilter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	s := storageOf(schema)
	start, ok, err := replayStart(ctx, s, db, f)
	if err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("event %s is not in the archive (was the relay run with --retain?)", f.FromEvent)
		}
		return 0, err
	}
	return s.CountArchived(ctx, db, start, int64(1<<63-1), archiveFilterOf(f))
}

// RequestReplay records a replay request for the leader to execute and
// returns its id.
func RequestReplay(ctx context.Context, db DB, schema string, f ReplayFilter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	filter, err := json.Marshal(f)
	if err != nil {
		return 0, err
	}
	id, err := storageOf(schema).RequestReplay(ctx, db, string(filter))
	if err != nil {
		return 0, fmt.Errorf("recording the replay request: %w", err)
	}
	return id, nil
}

func replayRequestOf(s store.ReplayRequest) (ReplayRequest, error) {
	q := ReplayRequest{ID: s.ID, Status: s.Status, Total: s.Total, Done: s.Done, Error: s.Error,
		CreatedAt: s.CreatedAt, StartedAt: s.StartedAt, UpdatedAt: s.UpdatedAt, FinishedAt: s.FinishedAt}
	if err := json.Unmarshal([]byte(s.Filter), &q.Filter); err != nil {
		return q, fmt.Errorf("replay request %d has an unreadable filter: %w", q.ID, err)
	}
	return q, nil
}

// GetReplay reads one replay request.
func GetReplay(ctx context.Context, db DB, schema string, id int64) (ReplayRequest, error) {
	s, found, err := storageOf(schema).GetReplay(ctx, db, id)
	if err != nil {
		return ReplayRequest{}, err
	}
	if !found {
		return ReplayRequest{}, fmt.Errorf("replay request %d does not exist", id)
	}
	return replayRequestOf(s)
}

// ListReplays returns the most recent replay requests, newest first.
func ListReplays(ctx context.Context, db DB, schema string, limit int) ([]ReplayRequest, error) {
	stored, err := storageOf(schema).ListReplays(ctx, db, limit)
	if err != nil {
		return nil, err
	}
	var out []ReplayRequest
	for _, s := range stored {
		q, err := replayRequestOf(s)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// CancelReplay stops a pending or running replay; events already
// republished stay in the log. It reports whether the request was still
// unfinished.
func CancelReplay(ctx context.Context, db DB, schema string, id int64) (bool, error) {
	return storageOf(schema).CancelReplay(ctx, db, id)
}
