// udp: `udp echo PORT` answers every datagram with "echo:" + payload;
// `udp client HOST:PORT` sends one datagram a second on a fresh socket and prints each reply (or timeout).
package main

import (
	"fmt"
	"net"
	"os"
	"time"
)

func echo(port string) {
	pc, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("echo listening on", pc.LocalAddr())
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			continue
		}
		fmt.Printf("echo: %d bytes from %s\n", n, from)
		pc.WriteTo(append([]byte("echo:"), buf[:n]...), from)
	}
}

func client(addr string) {
	host, _ := os.Hostname()
	for i := 0; ; i++ {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			fmt.Println("dial:", err)
			time.Sleep(time.Second)
			continue
		}
		msg := fmt.Sprintf("%s-%d", host, i)
		start := time.Now()
		conn.Write([]byte(msg))
		conn.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 65535)
		n, err := conn.Read(buf)
		if err != nil {
			fmt.Printf("query %d to %s: no reply (%v)\n", i, addr, err)
		} else {
			fmt.Printf("query %d to %s: reply %q from %s in %s\n", i, addr, buf[:n], conn.RemoteAddr(), time.Since(start))
		}
		conn.Close()
		time.Sleep(time.Second)
	}
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "echo" {
		echo(os.Args[2])
	} else if len(os.Args) == 3 && os.Args[1] == "client" {
		client(os.Args[2])
	} else {
		fmt.Println("usage: udp echo PORT | udp client HOST:PORT")
		os.Exit(2)
	}
}
