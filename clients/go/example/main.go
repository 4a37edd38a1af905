// The README's Go example: take a lock on a raftlock member, print its
// fencing token, release it.
//
//	GO111MODULE=off GOPATH=~/go:/usr/share/gocode go run raftlock/example [-endpoints 127.0.0.1:2379]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"raftlock"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "members, comma-separated")
	flag.Parse()
	ctx := context.Background()

	client, err := raftlock.Connect(ctx, strings.Split(*endpoints, ","))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	session, err := client.Session(ctx, 10*time.Second) // a lease, kept alive in the background
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close(ctx) // revokes the lease
	lock, err := session.Lock(ctx, "jobs/nightly", raftlock.Wait(5*time.Second)) // raftlock.ErrBusy if not granted in time
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", lock.Key(), "fencing token", lock.Token()) // <-lock.Lost(): the lock was lost
	if _, err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
}
