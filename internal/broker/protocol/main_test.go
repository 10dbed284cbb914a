package protocol

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/leakcheck"
)

// The test binary doubles as the helper processes of the crash tests
// (txn_eos_test.go, share_kill_test.go): with envTxnRole set it runs that
// role until killed instead of the tests.
const (
	envTxnRole = "RELAY_PROTOCOL_TEST_ROLE" // "processor", "broker" or "share-member"
	envTxnAddr = "RELAY_PROTOCOL_TEST_ADDR"
	envTxnDir  = "RELAY_PROTOCOL_TEST_DIR"
)

func TestMain(m *testing.M) {
	switch role := os.Getenv(envTxnRole); role {
	case "":
		// Sarama's metrics (rcrowley/go-metrics) start one process-wide
		// meter ticker at the first meter and never stop it, by design.
		leakcheck.Exit(m.Run(), goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
	case "processor":
		err := eosJob(os.Getenv(envTxnAddr), func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}).Run(context.Background())
		fmt.Fprintln(os.Stderr, "processor:", err)
		os.Exit(1)
	case "share-member":
		err := runShareMemberProcess(os.Getenv(envTxnAddr))
		fmt.Fprintln(os.Stderr, "share member:", err)
		os.Exit(1)
	case "broker":
		if err := runBrokerProcess(os.Getenv(envTxnDir), os.Getenv(envTxnAddr)); err != nil {
			fmt.Fprintln(os.Stderr, "broker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown role", role)
		os.Exit(2)
	}
}

// runBrokerProcess serves a broker on dir at addr until SIGTERM (or a
// SIGKILL, which is the point).
func runBrokerProcess(dir, addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	b, err := broker.Open(ctx, broker.Options{Dir: dir, JanitorInterval: -1, TxnCheckInterval: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	defer b.Close()
	srv, err := NewServer(b, Config{MinSessionTimeout: 500 * time.Millisecond, InitialRebalanceDelay: 100 * time.Millisecond, AutoCreateTopics: true,
		FetchSessionCacheSlots: fetchSessionSlotsFromEnv()})
	if err != nil {
		return err
	}
	defer srv.Close()
	var ln net.Listener
	for i := 0; ; i++ {
		// The port of the killed incarnation may take a moment to free.
		if ln, err = net.Listen("tcp", addr); err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond) // condition poll: the killed incarnation's port frees
	}
	if err != nil {
		return err
	}
	fmt.Println("serving", addr)
	return srv.Serve(ctx, ln)
}
