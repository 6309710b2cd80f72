// Command pubsub-fake serves Google's own Pub/Sub fake (pstest, from the Go Pub/Sub client
// module) over gRPC, for the Pub/Sub bridge's tests on machines without the Google Cloud
// CLI's emulator:
//
//	pubsub-fake --host=127.0.0.1 --port=8085
//	PUBSUB_EMULATOR_HOST=127.0.0.1:8085 python -m connectors pubsub ...
//
// The flags are the official emulator's, so the tests start either one the same way. It
// serves the Publisher and Subscriber APIs (topics, subscriptions, Publish, Pull,
// Acknowledge, ModifyAckDeadline, ack deadlines and redelivery) until SIGTERM or SIGINT,
// and prints one line once it listens. `make test-deps` builds it (Makefile).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc"
)

// maxRequestBytes bounds one gRPC request: above Pub/Sub's own limit (a publish request of
// 10 MB), so a message as large as the service takes reaches the bridge. gRPC's default of
// 4 MiB would refuse the messages the bridge must dead-letter as too large for Kafka.
const maxRequestBytes = 16 << 20

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 8085, "port to listen on (0: any free port)")
	flag.Parse()

	listener, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		log.Fatalf("pubsub-fake: cannot listen on %s:%d: %v", *host, *port, err)
	}
	// pstest's own server listens too (on a free loopback port nobody is told about) and
	// cannot take gRPC options; its service implementation is served here instead, behind
	// a server that accepts requests as large as Pub/Sub does.
	fake := pstest.NewServerWithAddress("127.0.0.1:0")
	defer fake.Close()
	server := grpc.NewServer(grpc.MaxRecvMsgSize(maxRequestBytes))
	pb.RegisterPublisherServer(server, &fake.GServer)
	pb.RegisterSubscriberServer(server, &fake.GServer)
	pb.RegisterSchemaServiceServer(server, &fake.GServer)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.Stop()
	}()

	fmt.Printf("pubsub-fake: Pub/Sub (pstest) listening on %s\n", listener.Addr())
	if err := server.Serve(listener); err != nil {
		log.Fatalf("pubsub-fake: %v", err)
	}
}
