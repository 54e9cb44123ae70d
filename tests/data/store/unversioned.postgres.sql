--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: claims; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.claims (
    job_id bigint NOT NULL,
    host text NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: drains; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.drains (
    host text NOT NULL,
    slot text NOT NULL,
    job_id bigint NOT NULL,
    since double precision NOT NULL
);


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    id bigint NOT NULL,
    at double precision NOT NULL,
    host text NOT NULL,
    kind text NOT NULL,
    subject text NOT NULL,
    detail text NOT NULL
);


--
-- Name: events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.events_id_seq OWNED BY public.events.id;


--
-- Name: gate; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gate (
    host text NOT NULL,
    gpu integer NOT NULL,
    state text NOT NULL
);


--
-- Name: protected; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.protected (
    host text NOT NULL,
    job_id bigint NOT NULL
);


--
-- Name: toggles; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.toggles (
    host text NOT NULL,
    target text NOT NULL,
    action text NOT NULL,
    who text NOT NULL,
    at double precision NOT NULL,
    why text NOT NULL
);


--
-- Name: users; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.users (
    name text NOT NULL,
    password_hash text NOT NULL,
    role text NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events ALTER COLUMN id SET DEFAULT nextval('public.events_id_seq'::regclass);


--
-- Data for Name: claims; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.claims VALUES (42, 'gpu-a', 1700000121.5);


--
-- Data for Name: drains; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.drains VALUES ('gpu-a', 'runnerctl/gpu-a/gpu0-3', 42, 1700000001.5);


--
-- Data for Name: events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.events VALUES (1, 1700000000, 'gpu-a', 'pause', 'runnerctl/gpu-a/gpu3', 'by carol: new fan');
INSERT INTO public.events VALUES (2, 1700000001.5, 'gpu-a', 'drain', 'runnerctl/gpu-a/gpu0-3', 'for pending job 42');


--
-- Data for Name: gate; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gate VALUES ('gpu-a', 5, '{"closed": true, "reason": "foreign process 77 (alice)"}');


--
-- Data for Name: protected; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.protected VALUES ('gpu-a', 42);


--
-- Data for Name: toggles; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.toggles VALUES ('gpu-a', 'gpu:3', 'pause', 'carol', 1700000000, 'new fan');
INSERT INTO public.toggles VALUES ('gpu-b', 'host', 'drain', 'dave', 1700000002, '');


--
-- Data for Name: users; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.users VALUES ('olga', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo', 'operator', 1700000003);


--
-- Name: events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.events_id_seq', 2, true);


--
-- Name: claims claims_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.claims
    ADD CONSTRAINT claims_pkey PRIMARY KEY (job_id);


--
-- Name: drains drains_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.drains
    ADD CONSTRAINT drains_pkey PRIMARY KEY (host, slot);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: gate gate_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gate
    ADD CONSTRAINT gate_pkey PRIMARY KEY (host, gpu);


--
-- Name: protected protected_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.protected
    ADD CONSTRAINT protected_pkey PRIMARY KEY (host, job_id);


--
-- Name: toggles toggles_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.toggles
    ADD CONSTRAINT toggles_pkey PRIMARY KEY (host, target);


--
-- Name: users users_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (name);


--
-- PostgreSQL database dump complete
--


