package cdc

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
)

// Config configures a Source. Zero fields take the defaults of
// WithDefaults.
type Config struct {
	// DatabaseURL is the connection string; empty means the PG* variables.
	// The role needs the REPLICATION attribute (or superuser) and, the
	// first time, the right to create a publication on the outbox table.
	DatabaseURL string
	// Schema holds the outbox table (default "outbox").
	Schema string
	// SlotName is the permanent logical replication slot. Lower-case
	// letters, digits and underscores. Empty: "relay_<schema>_<database
	// oid>", unique in the cluster, or "relay_<schema>" when a slot of
	// that name (the default of earlier relays) exists in this database
	// (resolveSlot).
	SlotName string
	// PublicationName is the publication of the outbox table's inserts
	// (default "relay_<schema>": publications belong to a database, so
	// this name does not collide across the databases of a cluster).
	PublicationName string
	// HeartbeatInterval is how often a WAL message is written so the slot
	// can advance while the outbox is idle and other tables are busy
	// (default 10s).
	HeartbeatInterval time.Duration
	// StatusInterval is the longest time between two standby status
	// updates (default 1s). An update is also sent as soon as an Acked
	// call moves the flush position, and whenever the server asks.
	StatusInterval time.Duration
	// QueueSize is how many decoded events may wait for Next (default
	// 10000). The stream stops reading while the queue is full, and keeps
	// sending status updates so the server does not time it out.
	QueueSize int
	// QueueBytes bounds the same queue by the bytes of the events' keys,
	// payloads and headers (default 16 MiB); a single larger event is
	// queued alone.
	QueueBytes int
	// MaxBackoff caps the delay between reconnection attempts (default
	// 10s).
	MaxBackoff time.Duration
	// SlotBusyTimeout is how long a running Source keeps retrying when,
	// on reconnecting, it finds its slot held by another process (usually
	// its own previous walsender, not yet gone after a network failure),
	// before Next fails with ErrSlotActive (default 90s, above the
	// server's default wal_sender_timeout of 60s). Start never waits: it
	// returns ErrSlotActive at once.
	SlotBusyTimeout time.Duration
	// NoStreaming reads pgoutput protocol version 1 even from servers that
	// can stream in-progress transactions (PostgreSQL 14 and later): the
	// server then holds every transaction until it commits (in memory up
	// to logical_decoding_work_mem, on its disk beyond).
	NoStreaming bool
	// NoFailoverSlot creates the slot without the failover property even
	// on PostgreSQL 17 and later, where by default it is created with it,
	// so that a standby with sync_replication_slots = on keeps a
	// synchronized copy that a promotion makes usable (see the package
	// documentation, "Failover slots").
	NoFailoverSlot bool
	// StreamMemoryBytes bounds the memory held by streamed transactions
	// that have not committed yet, all of them together (default 16 MiB);
	// beyond it their events are spilled to files in SpillDir.
	StreamMemoryBytes int
	// SpillDir holds the spill files of streamed transactions. The source
	// owns it while it holds the slot: spill files left in it by an
	// earlier process are removed when streaming starts. Empty:
	// os.TempDir()/relay-cdc-spill-<cluster system id>-<slot>, which only
	// the process holding that slot of that cluster uses.
	SpillDir string
	// Logger receives the source's logs (default slog.Default()).
	Logger *slog.Logger
}

// DefaultHeartbeatInterval is Config.HeartbeatInterval's default (and
// `relay run --heartbeat-interval`'s).
const DefaultHeartbeatInterval = 10 * time.Second

// WithDefaults returns c with its unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.PublicationName == "" {
		c.PublicationName = DefaultPublicationName(c.Schema)
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 10_000
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 16 << 20
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 10 * time.Second
	}
	if c.SlotBusyTimeout <= 0 {
		c.SlotBusyTimeout = 90 * time.Second
	}
	if c.StreamMemoryBytes <= 0 {
		c.StreamMemoryBytes = 16 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Replication slot names allow only these characters; publication names
// are kept to the same set so neither needs quoting in replication
// commands.
var namePattern = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Validate checks c after defaults are applied.
func (c Config) Validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	if c.SlotName != "" && !namePattern.MatchString(c.SlotName) {
		return fmt.Errorf("cdc: invalid slot name %q: use 1 to 63 lower-case letters, digits and underscores", c.SlotName)
	}
	if !namePattern.MatchString(c.PublicationName) {
		return fmt.Errorf("cdc: invalid publication name %q: use 1 to 63 lower-case letters, digits and underscores", c.PublicationName)
	}
	if _, err := pgconfig.ParseConfig(c.DatabaseURL); err != nil {
		return err
	}
	return nil
}
