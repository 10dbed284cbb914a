package protocol

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestEveryAPIHasAnAuthorizationRule: every API the server advertises
// (but Produce and Fetch, which handle() authorizes itself) has a rule in
// authorizeRequest, and a request type without one is refused, closing
// the connection, rather than served unchecked.
func TestEveryAPIHasAnAuthorizationRule(t *testing.T) {
	t.Parallel()
	authz, err := NewAuthorizer(AuthorizerConfig{DenyByDefault: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{authz: authz}
	c := &conn{principal: anonymous, host: "127.0.0.1"}
	for key := range supportedVersions {
		if key == kmsg.Produce.Int16() || key == kmsg.Fetch.Int16() {
			continue
		}
		req := kmsg.RequestForKey(key)
		if _, _, known := s.authorizeRequest(c, req); !known {
			t.Errorf("%s is advertised but has no authorization rule", kmsg.NameForKey(key))
		}
	}
	unknown := kmsg.NewPtrWriteTxnMarkersRequest()
	if _, _, err := s.authorizeSync(t.Context(), c, request{key: unknown.Key(), req: unknown}); !errors.Is(err, errUnauthorizedAPI) {
		t.Fatalf("a request without a rule: %v, want errUnauthorizedAPI", err)
	}
}

// TestACLsTransactionalID: the transaction APIs need Write on the
// TransactionalId resource, DescribeTransactions Describe, and
// ListTransactions lists only the ids the principal may describe.
func TestACLsTransactionalID(t *testing.T) {
	t.Parallel()
	allow := func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) ACL {
		return ACL{ResourceType: rt, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Principal: "User:*", Host: "*",
			Operation: op, Permission: kmsg.ACLPermissionTypeAllow}
	}
	authz, err := NewAuthorizer(AuthorizerConfig{DenyByDefault: true, ReadOnlyTopics: func(string) bool { return false }, Initial: []ACL{
		allow(kmsg.ACLResourceTypeTopic, "*", kmsg.ACLOperationAll),
		allow(kmsg.ACLResourceTypeGroup, "*", kmsg.ACLOperationAll),
		allow(kmsg.ACLResourceTypeTransactionalId, "ok", kmsg.ACLOperationWrite),
		allow(kmsg.ACLResourceTypeTransactionalId, "ok", kmsg.ACLOperationDescribe),
	}})
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, func(c *Config) { c.Authorizer = authz })
	ctx := testContext(t, 60*time.Second)
	const topic = "txn-acl"
	f.createTopic(t, topic, 1)

	ok := newKgo(t, f.addr, kgo.TransactionalID("ok"), kgo.DefaultProduceTopic(topic))
	defer ok.Close()
	txnProduce(t, ctx, ok, topic, "ok-", 3, true)

	denied := newKgo(t, f.addr, kgo.TransactionalID("secret"), kgo.DefaultProduceTopic(topic), kgo.RequestRetries(1))
	defer denied.Close()
	err = denied.BeginTransaction()
	if err == nil {
		err = denied.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr()
	}
	if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		t.Fatalf("producing under a transactional id without Write: %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", err)
	}
	if _, ok := f.b.Transaction("secret"); ok {
		t.Fatal("the refused transactional id was initialised")
	}

	// Raw requests under the refused id, sent to the broker itself (a
	// client's own routing would stop at FindCoordinator, which needs
	// Describe on the id).
	cl := newKgo(t, f.addr)
	defer cl.Close()
	if _, err := kmsg.NewPtrFindCoordinatorRequest().RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	raw := cl.Broker(0)
	end := kmsg.NewPtrEndTxnRequest()
	end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = "secret", 1, 0, true
	if resp, err := rawRequest[*kmsg.EndTxnResponse](ctx, raw, end); err != nil || resp.ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Fatalf("EndTxn for the refused id: %+v %v", resp, err)
	}
	addOffsets := kmsg.NewPtrAddOffsetsToTxnRequest()
	addOffsets.TransactionalID, addOffsets.Group = "secret", "g"
	if resp, err := rawRequest[*kmsg.AddOffsetsToTxnResponse](ctx, raw, addOffsets); err != nil || resp.ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Fatalf("AddOffsetsToTxn for the refused id: %+v %v", resp, err)
	}
	add := kmsg.NewPtrAddPartitionsToTxnRequest()
	add.TransactionalID = "secret"
	at := kmsg.NewAddPartitionsToTxnRequestTopic()
	at.Topic, at.Partitions = topic, []int32{0}
	add.Topics = append(add.Topics, at)
	if resp, err := rawRequest[*kmsg.AddPartitionsToTxnResponse](ctx, raw, add); err != nil || resp.Topics[0].Partitions[0].ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Fatalf("AddPartitionsToTxn for the refused id: %+v %v", resp, err)
	}
	describe := kmsg.NewPtrDescribeTransactionsRequest()
	describe.TransactionalIDs = []string{"ok", "secret"}
	dresp, err := rawRequest[*kmsg.DescribeTransactionsResponse](ctx, raw, describe)
	if err != nil || len(dresp.TransactionStates) != 2 || dresp.TransactionStates[0].ErrorCode != 0 ||
		dresp.TransactionStates[1].ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Fatalf("DescribeTransactions: %+v %v", dresp, err)
	}
	list := kmsg.NewPtrListTransactionsRequest()
	find := kmsg.NewPtrFindCoordinatorRequest()
	find.CoordinatorType, find.CoordinatorKeys = coordinatorTransaction, []string{"secret", "ok"}
	if resp, err := rawRequest[*kmsg.FindCoordinatorResponse](ctx, raw, find); err != nil || len(resp.Coordinators) != 2 ||
		resp.Coordinators[0].ErrorCode != kerr.TransactionalIDAuthorizationFailed.Code || resp.Coordinators[1].ErrorCode != 0 {
		t.Fatalf("FindCoordinator for the refused id: %+v %v", resp, err)
	}
	lresp, err := rawRequest[*kmsg.ListTransactionsResponse](ctx, raw, list)
	if err != nil || len(lresp.TransactionStates) != 1 || lresp.TransactionStates[0].TransactionalID != "ok" {
		t.Fatalf("ListTransactions: %+v %v", lresp, err)
	}
}

// rawRequest sends req to broker b as it is, without the client's routing.
func rawRequest[R kmsg.Response](ctx context.Context, b *kgo.Broker, req kmsg.Request) (R, error) {
	var zero R
	resp, err := b.Request(ctx, req)
	if err != nil {
		return zero, err
	}
	return resp.(R), nil
}
