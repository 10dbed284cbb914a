package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

// storage is every database operation of the core, of its maintenance
// services and of the operator commands on dead letters and replays. The
// statements' text lives in package relay/store (store.Postgres); here the
// operations are listed in one place. Each runs on the executor it is
// given (the pool, the lease connection or a transaction), so the
// transactions, and the guarantees they carry, are decided by the callers
// in this package: which statements commit together is in ack.go,
// leadership.go, release.go and replayer.go.
type storage interface {
	// Leadership (leadership.go).
	ObserveLease(ctx context.Context, db store.DB) (store.Lease, error)
	LockEpoch(ctx context.Context, tx store.DB) (int64, error)
	BumpEpoch(ctx context.Context, tx store.DB, epoch int64, holder string) (int64, error)
	SwapLease(ctx context.Context, tx store.DB, seenEpoch, seenRenewals, epoch, leaseMS int64) (bool, error)
	RenewLease(ctx context.Context, db store.DB, epoch int64) (bool, error)
	ReleaseLease(ctx context.Context, db store.DB, epoch int64) error
	Fence(ctx context.Context, tx store.DB, epoch int64) (bool, error)

	// The checkpoint and the acknowledgement (relay.go, ack.go,
	// oversize.go).
	LoadCheckpoint(ctx context.Context, db store.DB, name string) (store.Checkpoint, bool, error)
	QueueCheckpoint(b *pgx.Batch, name string, ck store.Checkpoint, published int)
	DeleteRanges(ctx context.Context, tx store.DB, lo, hi []int64) (int64, error)
	DeleteIDs(ctx context.Context, tx store.DB, ids []int64) (int64, error)
	ArchiveRows(ctx context.Context, tx store.DB, ids, published []int64) ([]int64, error)
	InsertDeadLetter(ctx context.Context, db store.DB, d store.DeadLetterRow) error
	QueueDeadLetter(b *pgx.Batch, d store.DeadLetterRow)
	CopyDeadLetter(ctx context.Context, db store.DB, d store.DeadLetterRow) (bool, error)

	// Readiness and the backlog (heartbeat.go, backlog.go).
	InsertHeartbeat(ctx context.Context, db store.DB, topic string, payload []byte) error
	Backlog(ctx context.Context, db store.DB) (int64, error)

	// Held keys and their releases (hold.go, release.go).
	LoadHolds(ctx context.Context, db store.DB) ([]store.Hold, error)
	CountHolds(ctx context.Context, db store.DB) (keys, events int64, err error)
	PickRelease(ctx context.Context, db store.DB) (int64, bool, error)
	ReadHolder(ctx context.Context, db store.DB, id int64) (store.Holder, error)
	KeyHolder(ctx context.Context, db store.DB, topic, key string) (int64, error)
	HeldEvents(ctx context.Context, db store.DB, holderRow int64, limit int) ([]store.StoredEvent, error)
	QueueRepublished(b *pgx.Batch, id int64)
	QueueRetryFailed(b *pgx.Batch, id int64, reason, errText string)
	QueueReleased(b *pgx.Batch, ids []int64)
	QueueNewHolder(b *pgx.Batch, id int64, reason, errText string)
	QueueMoveHeld(b *pgx.Batch, fromRow, toRow, exceptID int64)
	QueueReleaseDone(b *pgx.Batch, holderID, holderRow int64)

	// Retention and replay (replayer.go, replay.go).
	PruneArchive(ctx context.Context, db store.DB, olderThan string, limit int) (int64, error)
	PickReplay(ctx context.Context, db store.DB) (int64, bool, error)
	ReplayInFlight(ctx context.Context, db store.DB) (store.InFlight, bool, error)
	LockReplay(ctx context.Context, tx store.DB, id int64) (store.ReplayState, error)
	StartReplay(ctx context.Context, db store.DB, id, cursor, bound, total int64) error
	FailReplay(ctx context.Context, db store.DB, id int64, message string) error
	MarkReplayInFlight(ctx context.Context, db store.DB, id, through int64) error
	ReplayAck(ctx context.Context, db store.DB, id, through int64, sent int) error
	QueueReplayAck(b *pgx.Batch, id, through int64, sent int)
	ReplayChunk(ctx context.Context, db store.DB, after, through int64, f store.ArchiveFilter, limit int) ([]store.StoredEvent, error)
	ArchiveStartAtEvent(ctx context.Context, db store.DB, eventID string) (*int64, error)
	ArchiveStartSince(ctx context.Context, db store.DB, since time.Time) (*int64, error)
	ArchiveTop(ctx context.Context, db store.DB) (int64, error)
	CountArchived(ctx context.Context, db store.DB, after, through int64, f store.ArchiveFilter) (int64, error)

	// The operator's commands (replay.go, deadletters.go).
	RequestReplay(ctx context.Context, db store.DB, filter string) (int64, error)
	GetReplay(ctx context.Context, db store.DB, id int64) (store.ReplayRequest, bool, error)
	ListReplays(ctx context.Context, db store.DB, limit int) ([]store.ReplayRequest, error)
	CancelReplay(ctx context.Context, db store.DB, id int64) (bool, error)
	ListDeadLetters(ctx context.Context, db store.DB, f store.DeadLetterFilter, limit int) ([]store.DeadLetter, error)
	RetryDeadLetters(ctx context.Context, tx store.DB, f store.DeadLetterFilter) (int64, error)
	DiscardDeadLetters(ctx context.Context, db store.DB, f store.DeadLetterFilter, note string) (int64, error)
}

var _ storage = (*store.Postgres)(nil)

// storageOf is the storage of the relay's tables in schema.
func storageOf(schema string) storage { return store.New(schema) }

// eventOf is a stored event (a dead letter's, an archived one) as the
// pipeline handles it.
func eventOf(s store.StoredEvent) Event {
	return Event{ID: s.Row, EventID: s.EventID, Topic: s.Topic, Key: s.Key, Payload: s.Payload, Headers: s.Headers, CreatedAt: s.CreatedAt}
}
