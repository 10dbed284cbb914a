package protocol

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/jitter"
)

// Config configures a Server. The zero value serves with Kafka-like
// defaults and advertises each connection's own local address.
type Config struct {
	// AdvertisedAddr is the host:port clients are told to connect to in
	// Metadata and FindCoordinator responses. It overrides AdvertisedHost
	// and AdvertisedPort.
	AdvertisedAddr string
	// AdvertisedHost and AdvertisedPort set the advertised address piece by
	// piece; an unset piece is taken from the local address of the
	// connection asking, which is right whenever clients reach the listener
	// directly.
	AdvertisedHost string
	AdvertisedPort int
	// ClusterID is reported in Metadata (default "relay").
	ClusterID string
	// MaxFrameBytes is the largest request accepted; a bigger frame closes
	// the connection (default 100 MiB).
	MaxFrameBytes int
	// AutoCreateTopics creates unknown topics, with the broker's defaults,
	// when a Metadata request asks for them and allows auto-creation.
	AutoCreateTopics bool
	// MinSessionTimeout and MaxSessionTimeout bound the session timeout a
	// group member may ask for (Kafka's group.min/max.session.timeout.ms;
	// default 6s and 30m).
	MinSessionTimeout time.Duration
	MaxSessionTimeout time.Duration
	// InitialRebalanceDelay holds the first rebalance of an empty group so
	// that members starting together join one generation (Kafka's
	// group.initial.rebalance.delay.ms; default 3s, negative for none). Each
	// new member extends the wait by this much, up to the rebalance timeout.
	InitialRebalanceDelay time.Duration
	// ConsumerSessionTimeout and ConsumerHeartbeatInterval are the
	// session timeout and the heartbeat interval of KIP-848 consumer
	// group members, set by the broker as in Kafka
	// (group.consumer.session.timeout.ms, default 45s, and
	// group.consumer.heartbeat.interval.ms, default 5s).
	ConsumerSessionTimeout    time.Duration
	ConsumerHeartbeatInterval time.Duration
	// FetchSessionCacheSlots is how many incremental fetch sessions
	// (KIP-227) the server keeps (Kafka's
	// max.incremental.fetch.session.cache.slots, default 1000); negative
	// turns fetch sessions off, every fetch then being a full one.
	FetchSessionCacheSlots int
	// EphemeralGroups keeps this server's consumer-group membership in
	// memory only: it neither restores the memberships saved in the
	// broker nor saves its own. For a second server on a broker whose
	// groups another server coordinates (the data directory's admin
	// socket beside the Kafka listener): restoring them would arm session
	// timers no member renews, since members heartbeat the other server,
	// and expiring them would save an empty group over the live one.
	EphemeralGroups bool
	// LostDataErrorCode answers a fetch of offsets the broker reports lost
	// (broker.ErrDataLost): CORRUPT_MESSAGE (2, the default), which Java
	// consumers raise to the application but franz-go retries quietly
	// unless kgo.KeepRetryableFetchErrors is set, or UNKNOWN_SERVER_ERROR
	// (-1), which franz-go surfaces and Java consumers retry with a
	// warning.
	LostDataErrorCode int16
	// TLS, when set, makes the listener speak TLS only: every connection
	// completes a handshake with this configuration (its certificate, and
	// with ClientAuth set, the client certificates it requires and the CAs
	// it trusts) within HandshakeTimeout, or is closed. A verified client
	// certificate names the connection's principal, User:<subject common
	// name>, unless SASL authenticates it.
	TLS *tls.Config
	// Users, when set, makes SASL authentication mandatory: a connection
	// may send only ApiVersions, SaslHandshake and SaslAuthenticate (in
	// frames of at most 512 KiB) until it authenticated as one of these
	// users, within HandshakeTimeout, and is closed otherwise. Its
	// principal is then User:<name>.
	Users Credentials
	// SASLMechanisms are the mechanisms offered with Users (default
	// SCRAM-SHA-256 and SCRAM-SHA-512). PLAIN sends the password itself:
	// offer it over TLS only.
	SASLMechanisms []string
	// Authorizer, when set, checks every request against its ACLs (see
	// authz.go); without it every client may do everything, as before.
	Authorizer *Authorizer
	// AllowRepartition, when set and true, lets CreatePartitions raise a
	// topic's partition count; otherwise it is refused with
	// POLICY_VIOLATION and the report of the keys it would move
	// (broker.KeyMovement). It is asked at each request.
	AllowRepartition func() bool
	// HandshakeTimeout bounds a new connection's TLS handshake and SASL
	// authentication together (default 10s).
	HandshakeTimeout time.Duration
	// PartitionSeries decides whether the broker's per-partition storage
	// series are exported (storage_metrics.go).
	PartitionSeries PartitionSeries
	// MaxInFlightBytes is the server-wide budget of bytes held for
	// requests being read and handled (half) and for fetch responses until
	// they are written (the other half); 0: none. A request waits for its
	// bytes before it is read, so over-budget clients are slowed, not
	// refused; MaxFrameBytes is lowered to a quarter of the budget (half
	// the requests' share, so one frame never holds all of it), and a
	// fetch response is cut to a quarter too.
	MaxInFlightBytes int64
	// MaxConnections and MaxConnectionsPerAddress bound the open
	// connections, in all and from one client IP address (0: no limit,
	// as Kafka's max.connections and max.connections.per.ip are by
	// default; the relay's command sets DefaultMaxConnections in all and
	// no per-address limit); a connection over either is closed as soon
	// as it is accepted, counted in
	// relay_listener_connections_refused_total{limit} and logged at most
	// once per limit every 10 seconds with the limit and the address.
	MaxConnections           int
	MaxConnectionsPerAddress int
	// IdleTimeout closes a connection that sent no request for this long
	// (0: never; Kafka's connections.max.idle.ms is 10 minutes).
	IdleTimeout time.Duration
	// IOTimeout bounds reading the rest of a request once its size
	// arrived, and writing one response (default 30s): a client that
	// trickles a frame or stops reading its responses is closed, and
	// what it held of the budget freed.
	IOTimeout time.Duration
	// Logger receives connection and group events (default slog.Default()).
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxFrameBytes             = 100 << 20
	DefaultMinSessionTimeout         = 6 * time.Second
	DefaultMaxSessionTimeout         = 30 * time.Minute
	DefaultInitialRebalanceDelay     = 3 * time.Second
	DefaultConsumerSessionTimeout    = 45 * time.Second
	DefaultConsumerHeartbeatInterval = 5 * time.Second
	DefaultFetchSessionCacheSlots    = 1000
	DefaultClusterID                 = "relay"
	DefaultHandshakeTimeout          = 10 * time.Second
	DefaultIOTimeout                 = 30 * time.Second
	// DefaultMaxConnections is the total connection limit the relay's
	// command sets: room for a fleet of thousands of clients (each
	// holds a connection per broker it knows, plus one to its group
	// coordinator), below the process's open-file limit.
	DefaultMaxConnections = 10000
)

// nodeID is the broker id of the one node this server is.
const nodeID int32 = 0

// positiveOr sets an unset setting (zero or negative) to its default.
func positiveOr[T ~int | ~int32 | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

func (c Config) withDefaults() Config {
	if c.ClusterID == "" {
		c.ClusterID = DefaultClusterID
	}
	positiveOr(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	positiveOr(&c.MinSessionTimeout, DefaultMinSessionTimeout)
	positiveOr(&c.MaxSessionTimeout, DefaultMaxSessionTimeout)
	if c.InitialRebalanceDelay == 0 {
		c.InitialRebalanceDelay = DefaultInitialRebalanceDelay
	}
	if c.InitialRebalanceDelay < 0 {
		c.InitialRebalanceDelay = 0
	}
	positiveOr(&c.ConsumerSessionTimeout, DefaultConsumerSessionTimeout)
	positiveOr(&c.ConsumerHeartbeatInterval, DefaultConsumerHeartbeatInterval)
	if c.FetchSessionCacheSlots == 0 {
		c.FetchSessionCacheSlots = DefaultFetchSessionCacheSlots
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Users != nil && len(c.SASLMechanisms) == 0 {
		c.SASLMechanisms = slices.Clone(SCRAMMechanisms)
	}
	positiveOr(&c.IOTimeout, DefaultIOTimeout)
	if c.MaxInFlightBytes > 0 && int64(c.MaxFrameBytes) > c.MaxInFlightBytes/4 {
		c.MaxFrameBytes = int(max(c.MaxInFlightBytes/4, 8))
	}
	positiveOr(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	if c.LostDataErrorCode == 0 {
		c.LostDataErrorCode = kerr.CorruptMessage.Code
	}
	return c
}

// Validate reports unusable settings.
func (c Config) Validate() error {
	if c.AdvertisedAddr != "" {
		host, port, err := net.SplitHostPort(c.AdvertisedAddr)
		if err != nil {
			return fmt.Errorf("protocol: advertised address %q: %w", c.AdvertisedAddr, err)
		}
		if host == "" {
			return fmt.Errorf("protocol: advertised address %q has no host", c.AdvertisedAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("protocol: advertised address %q has an invalid port", c.AdvertisedAddr)
		}
	}
	if c.AdvertisedPort < 0 || c.AdvertisedPort > 65535 {
		return fmt.Errorf("protocol: advertised port %d out of range", c.AdvertisedPort)
	}
	if c.MaxInFlightBytes < 0 || c.MaxConnections < 0 || c.MaxConnectionsPerAddress < 0 || c.IdleTimeout < 0 {
		return errors.New("protocol: negative limit")
	}
	if c.MinSessionTimeout > 0 && c.MaxSessionTimeout > 0 && c.MinSessionTimeout > c.MaxSessionTimeout {
		return fmt.Errorf("protocol: min session timeout %v above max %v", c.MinSessionTimeout, c.MaxSessionTimeout)
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil {
		return errors.New("protocol: TLS configuration has no server certificate")
	}
	for _, m := range c.SASLMechanisms {
		if m != MechanismPlain && m != MechanismSCRAM256 && m != MechanismSCRAM512 {
			return fmt.Errorf("protocol: SASL mechanism %q: want %s, %s or %s", m, MechanismPlain, MechanismSCRAM256, MechanismSCRAM512)
		}
	}
	if len(c.SASLMechanisms) > 0 && c.Users == nil {
		return errors.New("protocol: SASL mechanisms without users")
	}
	switch c.LostDataErrorCode {
	case 0, kerr.CorruptMessage.Code, kerr.UnknownServerError.Code:
	default:
		return fmt.Errorf("protocol: lost data error code %d is neither CORRUPT_MESSAGE (%d) nor UNKNOWN_SERVER_ERROR (%d)",
			c.LostDataErrorCode, kerr.CorruptMessage.Code, kerr.UnknownServerError.Code)
	}
	return nil
}

// Server answers the Kafka protocol over an embedded broker. One Server may
// Serve several listeners; all share its group coordinator.
type Server struct {
	b      *broker.Broker
	cfg    Config
	log    *slog.Logger
	groups *coordinator
	share  *shareCoordinator
	// offsets serves __consumer_offsets (offsets_topic.go).
	offsets *offsetsLog

	advHost string
	advPort int32

	users       Credentials
	authz       *Authorizer
	budget      *budget
	fetchBudget *budget
	// fetchSessions is nil when fetch sessions are off.
	fetchSessions *fetchSessionCache
	mechanisms    []string
	stats         listenerStats
	refusals      refusalLog

	mu        sync.Mutex
	closed    bool
	conns     map[net.Conn]struct{}
	open      int
	perHost   map[string]int
	listeners map[net.Listener]struct{}
	wg        sync.WaitGroup
	done      chan struct{}
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("protocol: server closed")

// NewServer returns a Server over b, which stays owned by the caller: close
// the Server before the broker.
func NewServer(b *broker.Broker, cfg Config) (*Server, error) {
	if b == nil {
		return nil, errors.New("protocol: nil broker")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		b:         b,
		cfg:       cfg,
		log:       cfg.Logger,
		conns:     map[net.Conn]struct{}{},
		perHost:   map[string]int{},
		listeners: map[net.Listener]struct{}{},
		done:      make(chan struct{}),
	}
	s.users, s.mechanisms, s.authz = cfg.Users, cfg.SASLMechanisms, cfg.Authorizer
	s.budget, s.fetchBudget = newBudget(cfg.MaxInFlightBytes/2), newBudget(cfg.MaxInFlightBytes-cfg.MaxInFlightBytes/2)
	s.advHost, s.advPort = cfg.AdvertisedHost, int32(cfg.AdvertisedPort)
	if cfg.AdvertisedAddr != "" {
		host, port, _ := net.SplitHostPort(cfg.AdvertisedAddr)
		p, _ := strconv.Atoi(port)
		s.advHost, s.advPort = host, int32(p)
	}
	if cfg.FetchSessionCacheSlots > 0 {
		s.fetchSessions = newFetchSessionCache(cfg.FetchSessionCacheSlots)
	}
	s.groups = newCoordinator(s)
	s.share = newShareCoordinator(s)
	s.offsets = newOffsetsLog()
	return s, nil
}

// Serve accepts connections on ln until ctx ends or Close is called, then
// closes ln and every connection it accepted and waits for their handlers.
// It returns nil when ctx ends, ErrServerClosed after Close, and the
// listener's error if accepting fails for good.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var conns sync.WaitGroup
	defer conns.Wait()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return ErrServerClosed
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("kafka listener accept failed; retrying", "err", err, "backoff", backoff)
				select {
				case <-time.After(jitter.Spread(backoff)):
				case <-ctx.Done():
				}
				continue
			}
			return fmt.Errorf("protocol: accept: %w", err)
		}
		backoff = 0
		if !s.admit(nc) {
			_ = nc.Close()
			continue
		}
		if !s.track(nc) {
			s.leave(nc)
			_ = nc.Close()
			return ErrServerClosed
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer s.leave(nc)
			defer s.untrack(nc)
			s.serveConn(ctx, nc)
		}()
	}
}

func (s *Server) track(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[nc] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
	s.wg.Done()
}

// Close stops every Serve call, closes all connections, waits for their
// handlers and stops the group coordinator's timers. Committed offsets are
// already durable in the broker; group membership is not kept.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	var errs []error
	for ln := range s.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for nc := range s.conns {
		_ = nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.groups.close()
	s.share.close()
	return errors.Join(errs...)
}

// advertised returns the host and port to hand to clients of a connection
// whose local address is local.
func (s *Server) advertised(local net.Addr) (string, int32) {
	host, port := s.advHost, s.advPort
	if host != "" && port != 0 {
		return host, port
	}
	if ta, ok := local.(*net.TCPAddr); ok {
		if host == "" {
			host = ta.IP.String()
			if ta.IP.IsUnspecified() {
				host = "127.0.0.1"
			}
		}
		if port == 0 {
			port = int32(ta.Port)
		}
		return host, port
	}
	if h, p, err := net.SplitHostPort(local.String()); err == nil {
		n, _ := strconv.Atoi(p)
		if host == "" {
			host = h
		}
		if port == 0 {
			port = int32(n)
		}
	}
	return host, port
}

// listenerStats count what the listener refused, for its metrics.
type listenerStats struct {
	authFailures      atomic.Int64
	refusedTotal      atomic.Int64
	refusedPerAddress atomic.Int64
}
